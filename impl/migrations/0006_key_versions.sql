-- A number per user that every change to one of the user's API keys
-- bumps, so that a server keeping the first page of a user's keys in memory
-- (dashboards poll it; see `api_keys::KeyPages`) can tell with one indexed
-- read that the page is still current. Triggers keep it, not the code: a
-- key can also be made by another process (`sparring admin create-key`),
-- and every write to `api_keys` is seen. A user with no row is at 0.
CREATE TABLE api_key_versions (
    user_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TRIGGER api_keys_inserted AFTER INSERT ON api_keys BEGIN
    INSERT INTO api_key_versions (user_id, version) VALUES (NEW.user_id, 1)
        ON CONFLICT (user_id) DO UPDATE SET version = version + 1;
END;

-- Any column, `last_used_at` included: the page holds the stored time and
-- adds only the uses not yet written.
CREATE TRIGGER api_keys_updated AFTER UPDATE ON api_keys BEGIN
    INSERT INTO api_key_versions (user_id, version) VALUES (NEW.user_id, 1)
        ON CONFLICT (user_id) DO UPDATE SET version = version + 1;
    INSERT INTO api_key_versions (user_id, version) SELECT OLD.user_id, 1 WHERE OLD.user_id IS NOT NEW.user_id
        ON CONFLICT (user_id) DO UPDATE SET version = version + 1;
END;

CREATE TRIGGER api_keys_deleted AFTER DELETE ON api_keys BEGIN
    INSERT INTO api_key_versions (user_id, version) VALUES (OLD.user_id, 1)
        ON CONFLICT (user_id) DO UPDATE SET version = version + 1;
END;
