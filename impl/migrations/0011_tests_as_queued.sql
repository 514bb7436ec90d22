-- A test as it was when its runs were queued: the channel they call and the
-- evaluators (JSON) they are judged by, so that a change to the test while
-- they wait does not change them (as its scenario, personas, iterations and
-- pass threshold already do not). NULL for batch runs queued before this
-- migration: their runs use the test as it is.
ALTER TABLE batch_run_tests ADD COLUMN channel_id TEXT;
ALTER TABLE batch_run_tests ADD COLUMN evaluators TEXT;
