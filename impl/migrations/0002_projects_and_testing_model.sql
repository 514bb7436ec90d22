-- Projects, their members, and the testing model inside them.
--
-- Each resource keeps its identity, its project, the columns that are
-- filtered on or referred to, and `document`: the JSON of its remaining
-- editable fields, exactly as the API shows them. References between
-- resources are foreign keys with the default NO ACTION (checked at the end
-- of each statement), so deleting a project cascades through everything in
-- it in one statement, while deleting one resource that something still
-- refers to is refused by the application first (409 `in_use`, naming the
-- referrers) and by the database as a backstop.
--
-- Secrets (`webhook_secret`, `credentials`, `headers`) are BLOBs sealed with
-- the server's secret key (see impl/src/secrets.rs), never plain text.

CREATE TABLE projects (
    id                  TEXT PRIMARY KEY,
    name                TEXT NOT NULL,
    description         TEXT NOT NULL,
    webhook_url         TEXT,
    webhook_secret      BLOB,
    max_call_duration_s INTEGER NOT NULL,
    default_concurrency INTEGER NOT NULL,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL
);

CREATE TABLE project_members (
    project_id TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id    TEXT NOT NULL REFERENCES users (id),
    role       TEXT NOT NULL CHECK (role IN ('owner', 'editor', 'reviewer', 'viewer')),
    added_at   TEXT NOT NULL,
    PRIMARY KEY (project_id, user_id)
);
CREATE INDEX project_members_by_user ON project_members (user_id, project_id);

CREATE TABLE integrations (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    provider    TEXT NOT NULL,
    name        TEXT NOT NULL,
    config      TEXT NOT NULL,
    credentials BLOB,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE INDEX integrations_by_project ON integrations (project_id, id);

CREATE TABLE integration_phone_numbers (
    integration_id TEXT NOT NULL REFERENCES integrations (id) ON DELETE CASCADE,
    position       INTEGER NOT NULL,
    number         TEXT NOT NULL,
    label          TEXT NOT NULL,
    direction      TEXT NOT NULL,
    PRIMARY KEY (integration_id, position),
    UNIQUE (integration_id, number)
);

CREATE TABLE channels (
    id                  TEXT PRIMARY KEY,
    project_id          TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name                TEXT NOT NULL,
    kind                TEXT NOT NULL,
    target              TEXT NOT NULL,
    integration_id      TEXT REFERENCES integrations (id),
    header_names        TEXT NOT NULL,
    headers             BLOB,
    turn_timeout_ms     INTEGER NOT NULL,
    max_call_duration_s INTEGER NOT NULL,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL
);
CREATE INDEX channels_by_project ON channels (project_id, id);
CREATE INDEX channels_by_integration ON channels (integration_id);

CREATE TABLE personas (
    id         TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    document   TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX personas_by_project ON personas (project_id, id);

CREATE TABLE scenarios (
    id                 TEXT PRIMARY KEY,
    project_id         TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name               TEXT NOT NULL,
    mode               TEXT NOT NULL,
    default_persona_id TEXT REFERENCES personas (id),
    version            INTEGER NOT NULL,
    document           TEXT NOT NULL,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL
);
CREATE INDEX scenarios_by_project ON scenarios (project_id, id);
CREATE INDEX scenarios_by_default_persona ON scenarios (default_persona_id);

CREATE TABLE tests (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    channel_id  TEXT NOT NULL REFERENCES channels (id),
    scenario_id TEXT NOT NULL REFERENCES scenarios (id),
    document    TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE INDEX tests_by_project ON tests (project_id, id);
CREATE INDEX tests_by_channel ON tests (channel_id);
CREATE INDEX tests_by_scenario ON tests (scenario_id);

-- A test's personas, in order (a JSON list could not be referred to).
CREATE TABLE test_personas (
    test_id    TEXT NOT NULL REFERENCES tests (id) ON DELETE CASCADE,
    position   INTEGER NOT NULL,
    persona_id TEXT NOT NULL REFERENCES personas (id),
    PRIMARY KEY (test_id, position)
);
CREATE INDEX test_personas_by_persona ON test_personas (persona_id);

CREATE TABLE batches (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    description TEXT NOT NULL,
    concurrency INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE INDEX batches_by_project ON batches (project_id, id);

CREATE TABLE batch_tests (
    batch_id TEXT NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    test_id  TEXT NOT NULL REFERENCES tests (id),
    PRIMARY KEY (batch_id, position)
);
CREATE INDEX batch_tests_by_test ON batch_tests (test_id);

-- Integrations named by the `llm_judge` evaluators of scenarios and tests
-- (the evaluators themselves live in `document`).
CREATE TABLE scenario_judges (
    scenario_id    TEXT NOT NULL REFERENCES scenarios (id) ON DELETE CASCADE,
    integration_id TEXT NOT NULL REFERENCES integrations (id),
    PRIMARY KEY (scenario_id, integration_id)
);
CREATE INDEX scenario_judges_by_integration ON scenario_judges (integration_id);

CREATE TABLE test_judges (
    test_id        TEXT NOT NULL REFERENCES tests (id) ON DELETE CASCADE,
    integration_id TEXT NOT NULL REFERENCES integrations (id),
    PRIMARY KEY (test_id, integration_id)
);
CREATE INDEX test_judges_by_integration ON test_judges (integration_id);

CREATE INDEX activity_by_project ON activity (project_id, id);
