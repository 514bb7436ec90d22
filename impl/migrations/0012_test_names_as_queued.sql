-- A test's name as it was when its batch run started, for the per-test
-- report of a batch run (`GET /batch-runs/{id}/tests`). Batch runs started
-- before this migration take the test's name as it is now; NULL where the
-- test has been deleted since.
ALTER TABLE batch_run_tests ADD COLUMN name TEXT;
UPDATE batch_run_tests SET name = (SELECT name FROM tests WHERE tests.id = batch_run_tests.test_id);
