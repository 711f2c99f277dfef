#ifndef JOBSERVER_CPOSTGRES_SHIM_H
#define JOBSERVER_CPOSTGRES_SHIM_H
#include <libpq-fe.h>

/* PG_DIAG_SQLSTATE comes from postgres_ext.h as a character macro. */
static inline int cpostgres_diag_sqlstate(void) { return PG_DIAG_SQLSTATE; }

#endif
