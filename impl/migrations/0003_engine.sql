-- The engine: batch runs, the run queue, test results, the credit ledger and
-- webhook deliveries.
--
-- Times are kept twice where the engine computes with them: RFC 3339 text as
-- the API shows it, and `*_ms` (Unix milliseconds) for leases, queue
-- statistics and scheduling.
--
-- Runs and results name their test, scenario, persona and channel without a
-- foreign key: a result is history and outlives the resources it ran with.
-- Everything hangs off its project (ON DELETE CASCADE) except the credit
-- ledger, which belongs to the user and is never deleted.

-- Server-wide settings the database needs in its own statements (e.g. the
-- starting grant of a new user), written by the server on start.
CREATE TABLE server_settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE batch_runs (
    id               TEXT PRIMARY KEY,
    project_id       TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    -- Who asked for it: pays for it, and is the unit of fair scheduling.
    user_id          TEXT NOT NULL REFERENCES users (id),
    source           TEXT NOT NULL CHECK (source IN ('batch', 'channel', 'test')),
    batch_id         TEXT,
    channel_id       TEXT,
    test_id          TEXT,
    status           TEXT NOT NULL
                     CHECK (status IN ('queued', 'running', 'completed', 'cancelled', 'insufficient_credits')),
    concurrency      INTEGER NOT NULL CHECK (concurrency >= 1),
    total            INTEGER NOT NULL DEFAULT 0,
    queued           INTEGER NOT NULL DEFAULT 0 CHECK (queued >= 0),
    running          INTEGER NOT NULL DEFAULT 0 CHECK (running >= 0),
    passed           INTEGER NOT NULL DEFAULT 0,
    failed           INTEGER NOT NULL DEFAULT 0,
    errored          INTEGER NOT NULL DEFAULT 0,
    cancelled        INTEGER NOT NULL DEFAULT 0,
    -- The CI gate: NULL until the batch run ends.
    verdict          INTEGER,
    metadata         TEXT NOT NULL,
    credits_reserved INTEGER NOT NULL DEFAULT 0,
    credits_charged  INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    started_at       TEXT,
    finished_at      TEXT,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL,
    CHECK (queued + running + passed + failed + errored + cancelled = total)
);
CREATE INDEX batch_runs_by_project ON batch_runs (project_id, id);
CREATE INDEX batch_runs_by_batch ON batch_runs (batch_id, id);
-- The scheduler reads the unfinished ones.
CREATE INDEX batch_runs_active ON batch_runs (status) WHERE status IN ('queued', 'running');

-- The tests of a batch run and their pass thresholds, as they were when the
-- run was requested: the verdict does not move if a test changes later.
CREATE TABLE batch_run_tests (
    batch_run_id   TEXT NOT NULL REFERENCES batch_runs (id) ON DELETE CASCADE,
    test_id        TEXT NOT NULL,
    pass_threshold REAL NOT NULL,
    PRIMARY KEY (batch_run_id, test_id)
);

CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    batch_run_id     TEXT NOT NULL REFERENCES batch_runs (id) ON DELETE CASCADE,
    project_id       TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    test_id          TEXT NOT NULL,
    scenario_id      TEXT NOT NULL,
    persona_id       TEXT,
    iteration        INTEGER NOT NULL CHECK (iteration >= 1),
    status           TEXT NOT NULL CHECK (status IN ('queued', 'running', 'passed', 'failed', 'error', 'cancelled')),
    attempt          INTEGER NOT NULL DEFAULT 1,
    call_id          TEXT,
    test_result_id   TEXT,
    -- Held while running: which server process has it, and until when.
    lease_owner      TEXT,
    lease_expires_ms INTEGER,
    -- Why a run without a result ended (lease expired too often, cancelled
    -- before it started, its test was deleted).
    error            TEXT,
    queued_at        TEXT NOT NULL,
    queued_ms        INTEGER NOT NULL,
    started_at       TEXT,
    started_ms       INTEGER,
    finished_at      TEXT,
    finished_ms      INTEGER,
    credits          INTEGER NOT NULL DEFAULT 0,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL
);
CREATE INDEX runs_by_batch_run ON runs (batch_run_id, id);
-- The next queued run of a batch run, in order.
CREATE INDEX runs_queued ON runs (batch_run_id, id) WHERE status = 'queued';
CREATE INDEX runs_running ON runs (lease_expires_ms) WHERE status = 'running';
CREATE INDEX runs_by_user_status ON runs (user_id, status);
CREATE INDEX runs_by_finish ON runs (finished_ms) WHERE finished_ms IS NOT NULL;
CREATE INDEX runs_by_start ON runs (started_ms) WHERE started_ms IS NOT NULL;
CREATE INDEX runs_by_status_queued ON runs (status, queued_ms);

CREATE TABLE test_results (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    run_id       TEXT NOT NULL UNIQUE,
    batch_run_id TEXT NOT NULL,
    test_id      TEXT NOT NULL,
    call_id      TEXT NOT NULL UNIQUE,
    status       TEXT NOT NULL CHECK (status IN ('passed', 'failed', 'error')),
    created_at   TEXT NOT NULL,
    -- The whole TestResult as the API shows it.
    document     TEXT NOT NULL
);
CREATE INDEX test_results_by_test ON test_results (test_id, id);
CREATE INDEX test_results_by_batch_run ON test_results (batch_run_id, id);

-- The credit ledger. `seq` orders a user's entries; the balance is the last
-- entry's `balance_after`, which is the sum of the user's amounts (every
-- entry is written by the single writer from the previous balance) and never
-- negative.
CREATE TABLE transactions (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    user_id       TEXT NOT NULL REFERENCES users (id),
    kind          TEXT NOT NULL CHECK (kind IN ('grant', 'purchase', 'reservation', 'refund', 'adjustment')),
    amount        INTEGER NOT NULL,
    balance_after INTEGER NOT NULL CHECK (balance_after >= 0),
    description   TEXT NOT NULL,
    batch_run_id  TEXT,
    created_at    TEXT NOT NULL
);
CREATE INDEX transactions_by_user ON transactions (user_id, seq);
CREATE INDEX transactions_by_user_id ON transactions (user_id, id);

CREATE TABLE webhook_deliveries (
    id                   TEXT PRIMARY KEY,
    project_id           TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    event                TEXT NOT NULL,
    batch_run_id         TEXT NOT NULL,
    url                  TEXT NOT NULL,
    -- The exact body sent (no secrets in it); signed at each attempt.
    payload              TEXT NOT NULL,
    status               TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts             INTEGER NOT NULL DEFAULT 0,
    last_response_status INTEGER,
    last_error           TEXT,
    next_attempt_at      TEXT,
    next_attempt_ms      INTEGER,
    created_at           TEXT NOT NULL,
    updated_at           TEXT NOT NULL
);
CREATE INDEX webhook_deliveries_by_project ON webhook_deliveries (project_id, id);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_ms) WHERE status = 'pending';
