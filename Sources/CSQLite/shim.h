#ifndef JOBSERVER_CSQLITE_SHIM_H
#define JOBSERVER_CSQLITE_SHIM_H
#include <sqlite3.h>

/* SQLITE_TRANSIENT is a cast macro that Swift does not import. */
static inline sqlite3_destructor_type csqlite_transient(void) { return SQLITE_TRANSIENT; }

/* sqlite3_config is variadic, which Swift cannot call. Turns off SQLite's memory statistics, which take a process-wide
   mutex around every allocation and free; effective only before SQLite is first initialised (else SQLITE_MISUSE). */
static inline int csqlite_disable_memory_statistics(void) { return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); }

#endif
