-- A project's tests are found by `tests_by_project` again, without each
-- test's served JSON beside its key (`tests_listing`, migration 0007).
-- That index made a page of a project's tests cheap under writes by never
-- reading the table; the page polled most, the first, is now answered
-- from memory (`test_cache`), while every create still wrote its served
-- JSON twice and split a leaf of ~1 KB entries every few tests. Without
-- it `POST /v1/tests` took ~7 % more writes a second and its p99 fell by
-- ~1.4 ms; a page after a cursor, which now reads the table, ~10 % fewer
-- (BENCHMARKS.md).
CREATE INDEX tests_by_project ON tests (project_id, id);
DROP INDEX tests_listing;
