-- The members a project had when it was deleted. Its activity records (the
-- project's own deletion among them) stay readable by those who could read
-- them (spec, GET /activity/resource/...), though the project and its
-- memberships are gone.
CREATE TABLE former_members (
    user_id    TEXT NOT NULL,
    project_id TEXT NOT NULL,
    PRIMARY KEY (user_id, project_id)
) WITHOUT ROWID;
