/*
Design notes for the store (markdown). Kept as a comment in a Swift file so that
SwiftPM does not treat it as an unhandled resource.

# Store

`JobStore` (JobStore.swift) is the persistence contract the engine and the
REST layer use; `SQLiteJobStore` implements it on one SQLite file. Nothing
SQLite-specific leaks through the protocol, so a PostgreSQL store can follow.

| file | what |
|---|---|
| `JobStore.swift` | `JobStore`, `StoreError`, `CreateOutcome`, `JobPage` |
| `SQLiteJobStore.swift` | the store: writer thread and queue, reader pool, row mapping, list cursors |
| `SQLiteConnection.swift` | the only file that imports `CSQLite`: connection, cached prepared statements |
| `StoreSchema.swift` | the schema as `PRAGMA user_version` migrations |
| `StoreSync.swift` | mutex/condition, write tickets, the writer's OS thread |

## Threads

- **One writer thread** owns the only writing connection. `createJob`,
  `enqueue`, `deleteJob`, `sweep` and `flush` put an op on its queue; it takes
  *everything* queued, runs it in one `BEGIN IMMEDIATE … COMMIT` with cached
  prepared statements, then answers the waiting callers. Concurrent
  submissions therefore share one transaction and one fsync (group commit).
  Within a batch only the last queued record of each job / node is written.
  If one op fails (e.g. a duplicate job id) the batch is rolled back and each op
  is written in its own transaction, so only the bad op fails. If the database
  itself refuses (busy, full, I/O) every op in the batch gets that error;
  failed `enqueue`d changes are logged and reported by the next `flush`.
- **Readers** borrow a connection from a small pool (8 kept idle, more opened
  under load). WAL readers see the last commit and never wait for the writer.

## Durability

The file is in WAL mode with `synchronous=NORMAL`: a commit reaches the WAL
(OS page cache) but is fsynced only at checkpoints. That survives a crash or
`kill -9` of the process, not a power cut — acceptable for state changes,
which recovery redoes. A batch that contains a `createJob` is committed with
`synchronous=FULL` (the WAL is fsynced before `COMMIT` returns), because a
`201` promises the job survives anything. Checked with strace: 20 creates →
20 `fdatasync`, 20 enqueue+flush → 0. `StoreDurabilityTests` kills a writing
child process with SIGKILL and checks every answered job and flushed change.

## Schema (version 1)

- `jobs` — one row per job; progress counts as columns; `idempotency_key`
  UNIQUE with `request_hash`; `request`/`result` (the large ones) last.
  Indexes: `(state, id)` for filtered newest-first listings and recovery,
  `finished_at` (partial) for the sweep. The primary key serves unfiltered listings.
- `nodes` — `WITHOUT ROWID`, primary key `(job_id, position)`, index `(job_id, id)`.
- `bodies` — `(job_id, node_id)` → content type and bytes.

No foreign keys: deleting a job deletes its nodes and bodies explicitly,
and changes or bodies queued for a job that no longer exists are ignored.
JSON is stored as its compact text; SQL `NULL` means absent, the text `null`
means JSON null. Times are integer ms since the epoch.

Migrations: append to `StoreSchema.migrations`; each runs in its own
transaction with the `user_version` bump. A file with a newer version than
the code is refused (`StoreError.Kind.migrate`).

## Reads that leave things out

- `listJobs` returns jobs with `result = nil` and `request = .null` (the API
  lists jobs without results; requests may be up to 1 MiB each).
- `nodes(jobID:includeResults: false)` returns `result = nil`.
- `enqueue` never rewrites a job's `request`.
*/
