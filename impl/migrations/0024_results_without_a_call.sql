-- A test result names a call only when one was made: a conversation whose
-- agent was never reached (its connection refused, or never made) was sent
-- no call id, and its result's `call_id` is null, as its run's is. The
-- column loses its NOT NULL (it stays UNIQUE: SQLite lets any number of
-- rows hold NULL there).
--
-- A table cannot be rebuilt here: `reviews` refer to `test_results` with
-- ON DELETE CASCADE, and foreign keys cannot be turned off inside this
-- migration's transaction, so dropping the old table would delete every
-- review. Removing a NOT NULL changes nothing stored, and SQLite documents
-- doing it by editing the table's definition (ALTER TABLE, "Making Other
-- Kinds Of Table Schema Changes"); the Rust step of this migration
-- (`store::results_without_a_call`) then bumps the schema version, checks
-- the change took, and clears the call id of the results already stored
-- whose run made no call.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema SET sql = replace(sql, 'call_id      TEXT NOT NULL UNIQUE,', 'call_id      TEXT UNIQUE,')
WHERE type = 'table' AND name = 'test_results';
PRAGMA writable_schema = OFF;
