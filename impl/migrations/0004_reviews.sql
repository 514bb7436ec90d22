-- Human review and calibration (DESIGN §6).
--
-- A review is one person's verdict on one test result, with a label per
-- evaluator; a second review of the same result by the same person replaces
-- the first (same row). A calibration is a fixed set of results and
-- reviewers; the reviews that count toward it carry its id, which the
-- server sets when an assigned reviewer reviews one of its results while it
-- is open. A result is in at most one open calibration at a time (checked
-- when one is created), so a review never has to choose between two.

CREATE TABLE calibrations (
    id         TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    created_by TEXT NOT NULL,
    status     TEXT NOT NULL CHECK (status IN ('open', 'complete')),
    -- The CalibrationSample (JSON) the results were drawn with; NULL when
    -- they were given by id.
    sample     TEXT,
    created_at TEXT NOT NULL,
    closed_at  TEXT
);
CREATE INDEX calibrations_by_project ON calibrations (project_id, id);

CREATE TABLE calibration_results (
    calibration_id TEXT NOT NULL REFERENCES calibrations (id) ON DELETE CASCADE,
    test_result_id TEXT NOT NULL,
    -- The order the results were given or drawn in.
    position       INTEGER NOT NULL,
    PRIMARY KEY (calibration_id, test_result_id)
);
CREATE INDEX calibration_results_by_result ON calibration_results (test_result_id);

CREATE TABLE calibration_reviewers (
    calibration_id TEXT NOT NULL REFERENCES calibrations (id) ON DELETE CASCADE,
    user_id        TEXT NOT NULL,
    position       INTEGER NOT NULL,
    PRIMARY KEY (calibration_id, user_id)
);
CREATE INDEX calibration_reviewers_by_user ON calibration_reviewers (user_id);

CREATE TABLE reviews (
    id             TEXT PRIMARY KEY,
    project_id     TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    test_result_id TEXT NOT NULL REFERENCES test_results (id) ON DELETE CASCADE,
    reviewer_id    TEXT NOT NULL REFERENCES users (id),
    verdict        TEXT NOT NULL CHECK (verdict IN ('pass', 'fail')),
    -- [{name, passed}] as the API shows it.
    evaluations    TEXT NOT NULL,
    notes          TEXT NOT NULL,
    calibration_id TEXT REFERENCES calibrations (id) ON DELETE SET NULL,
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    UNIQUE (test_result_id, reviewer_id)
);
CREATE INDEX reviews_by_project ON reviews (project_id, id);
CREATE INDEX reviews_by_reviewer ON reviews (reviewer_id, id);
CREATE INDEX reviews_by_calibration ON reviews (calibration_id) WHERE calibration_id IS NOT NULL;
