-- A page of a project's tests, newest first, straight from one index: the
-- key of `tests_by_project` with each test's served JSON beside it, so a
-- page reads the index's leaves in order and never the table. Through the
-- table, the 50 tests of a page lay on as many pages as there were tests
-- of other projects written between them (a test's row, its document and
-- its served JSON, fills half a page), and under writes a reader's page
-- cache is emptied at every commit: a page of 50 fetched ~50 pages each
-- time, two thirds of what writes cost the reads of the 90/10 mix
-- (BENCHMARKS.md). In the index they lie side by side, a few to a page.
CREATE INDEX tests_listing ON tests (project_id, id, served);
DROP INDEX tests_by_project;
