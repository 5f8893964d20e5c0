/* Status names and the per-thread message of the last failing call. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

static _Thread_local char last_error[512];

kva_status kva_set_error(kva_status status, const char *fmt, ...) {
  /* Format into a temporary first: callers may pass kva_last_error() itself
   * as an argument to wrap a lower layer's message. */
  char msg[sizeof(last_error)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof(msg));
  return status;
}

const char *kva_last_error(void) { return last_error; }

const char *kva_strerror(kva_status status) {
  switch (status) {
    case KVA_OK: return "KVA_OK";
    case KVA_ERR_NULL_ARGUMENT: return "KVA_ERR_NULL_ARGUMENT";
    case KVA_ERR_INVALID_ARGUMENT: return "KVA_ERR_INVALID_ARGUMENT";
    case KVA_ERR_UNSUPPORTED: return "KVA_ERR_UNSUPPORTED";
    case KVA_ERR_OUT_OF_RANGE: return "KVA_ERR_OUT_OF_RANGE";
    case KVA_ERR_OUT_OF_PAGES: return "KVA_ERR_OUT_OF_PAGES";
    case KVA_ERR_OUT_OF_MEMORY: return "KVA_ERR_OUT_OF_MEMORY";
    case KVA_ERR_DOUBLE_FREE: return "KVA_ERR_DOUBLE_FREE";
    case KVA_ERR_CAPACITY: return "KVA_ERR_CAPACITY";
    case KVA_ERR_WORKSPACE_TOO_SMALL: return "KVA_ERR_WORKSPACE_TOO_SMALL";
    case KVA_ERR_NO_DEVICE: return "KVA_ERR_NO_DEVICE";
    case KVA_ERR_DEVICE: return "KVA_ERR_DEVICE";
    case KVA_ERR_STATE: return "KVA_ERR_STATE";
    case KVA_ERR_INTERNAL: return "KVA_ERR_INTERNAL";
  }
  return "KVA_ERR_UNKNOWN_STATUS";
}
