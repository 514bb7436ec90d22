-- What the hot reads need to answer without work per row (measured with
-- `cargo xtask bench api`, see BENCHMARKS.md).

-- A test as the API shows it (its JSON, written from the generated `Test`
-- type), kept beside the columns it is made of and rewritten in the same
-- transaction by every write of the test (impl/src/tests.rs `serve`).
-- `GET /tests/{id}` and a page of `GET /tests` answer with it as it is:
-- building each test from its columns and its personas (a subquery per
-- test) was most of a page's cost. Filled for the tests already there by
-- this migration's Rust step (`tests::serve_all`).
ALTER TABLE tests ADD COLUMN served TEXT NOT NULL DEFAULT '';

-- A page of a user's API keys straight from one index, without a lookup
-- into the table for each key.
DROP INDEX api_keys_by_user;
CREATE INDEX api_keys_listing ON api_keys (user_id, id, label, prefix, created_at, last_used_at, revoked_at);
