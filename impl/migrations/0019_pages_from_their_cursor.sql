-- A page of a batch run's tests (`GET /batch-runs/{id}/tests`) counts the
-- runs of its tests only: each test's runs, found by the batch run and the
-- test, not every run of the batch run for every page.
CREATE INDEX runs_by_test ON runs (batch_run_id, test_id);
