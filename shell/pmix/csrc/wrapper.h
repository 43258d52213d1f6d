/* The OpenPMIx server API the helper binds (bindgen input). */
#include <pmix_server.h>
#include <pmix.h>
