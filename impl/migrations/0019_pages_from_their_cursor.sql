-- A page of a batch run's tests (`GET /batch-runs/{id}/tests`) counts the
-- runs of its tests only: each test's runs, found by the batch run and the
-- test, not every run of the batch run for every page.
CREATE INDEX runs_by_test ON runs (batch_run_id, test_id);

-- A page of a project's members (`GET /projects/{id}/members`: added last
-- first, then by user id) is read in that order from its cursor on, not
-- every member sorted for each page.
CREATE INDEX project_members_by_added ON project_members (project_id, added_at, user_id);
