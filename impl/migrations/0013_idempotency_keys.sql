-- The `Idempotency-Key`s of run starts (`POST /batches/{id}/run`,
-- `/channels/{id}/run`, `/tests/{id}/run`), so that a start retried after a
-- lost answer returns the batch run the first attempt started instead of
-- starting (and reserving credits for) another. One row per key per user,
-- written in the start's own transaction; `request` is a hash of the
-- operation, its path and its body, to refuse the key for another request.
-- Kept 24 hours (`created_ms`), pruned by later starts.
CREATE TABLE idempotency_keys (
    user_id      TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    key          TEXT NOT NULL,
    request      TEXT NOT NULL,
    batch_run_id TEXT NOT NULL REFERENCES batch_runs (id) ON DELETE CASCADE,
    created_ms   INTEGER NOT NULL,
    PRIMARY KEY (user_id, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_ms);
CREATE INDEX idempotency_keys_by_batch_run ON idempotency_keys (batch_run_id);
