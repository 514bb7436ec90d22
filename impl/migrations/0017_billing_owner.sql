-- Whose credits pay for a project's batch runs (DESIGN §3: its owner). It
-- was whichever owner had been a member longest, so an owner could make
-- anyone they named pay: add them as an owner, then step down. The payer is
-- now an owner who chose to be: the project's creator, until another owner
-- takes billing over themselves (POST /projects/{id}/billing); the payer
-- stays an owner and a member until then. Projects made before keep the
-- payer they had.
ALTER TABLE projects ADD COLUMN billing_user_id TEXT REFERENCES users (id);
UPDATE projects SET billing_user_id = (
    SELECT user_id FROM project_members m
    WHERE m.project_id = projects.id AND m.role = 'owner'
    ORDER BY m.added_at, m.user_id LIMIT 1
);
