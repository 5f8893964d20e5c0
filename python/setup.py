# The wheel carries libkvattn.so, so it is tagged for this platform (the
# package itself is pure Python over ctypes; there is no extension module).
from setuptools import Distribution, setup


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(distclass=BinaryDistribution)
