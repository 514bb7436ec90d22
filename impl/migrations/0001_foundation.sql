-- Users, their API keys, and the activity log.
--
-- Times are RFC 3339 UTC text (sortable). Ids are `<prefix>_<uuidv7 hex>`,
-- so ordering by id is ordering by creation time.

CREATE TABLE users (
    id           TEXT PRIMARY KEY,
    email        TEXT UNIQUE,
    name         TEXT NOT NULL,
    -- Set for users who signed in with an ID token: (issuer, subject) is
    -- their identity; email may change at the issuer.
    oidc_issuer  TEXT,
    oidc_subject TEXT,
    is_admin     INTEGER NOT NULL DEFAULT 0,
    created_at   TEXT NOT NULL,
    UNIQUE (oidc_issuer, oidc_subject)
);

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL REFERENCES users (id),
    label        TEXT NOT NULL,
    -- Non-secret start of the key, for people to recognise it.
    prefix       TEXT NOT NULL,
    -- blake3 of the raw key. The raw key itself is never stored.
    key_hash     BLOB NOT NULL UNIQUE,
    created_at   TEXT NOT NULL,
    last_used_at TEXT,
    revoked_at   TEXT
);

CREATE INDEX api_keys_by_user ON api_keys (user_id, id);
CREATE INDEX api_keys_active_by_user ON api_keys (user_id) WHERE revoked_at IS NULL;

CREATE TABLE activity (
    id            TEXT PRIMARY KEY,
    actor_user_id TEXT,
    -- api_key | id_token | system
    credential    TEXT NOT NULL,
    api_key_id    TEXT,
    action        TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    project_id    TEXT,
    summary       TEXT NOT NULL,
    -- JSON object of the fields that changed, secrets masked.
    changes       TEXT NOT NULL,
    created_at    TEXT NOT NULL
);

CREATE INDEX activity_by_actor ON activity (actor_user_id, id);
CREATE INDEX activity_by_resource ON activity (resource_type, resource_id, id);
