-- The server no longer reads `api_key_versions`: a user's first page of
-- keys is kept until the server's own write to `api_keys` empties it
-- (`api_keys::KeyPages`), and while a server runs, keys are made only
-- through it (`sparring admin create-key` goes through its admin socket).
-- Its triggers would only add a write to every write of a key.
DROP TRIGGER api_keys_inserted;
DROP TRIGGER api_keys_updated;
DROP TRIGGER api_keys_deleted;
DROP TABLE api_key_versions;
