-- The user a record outside any project is about, when that is not its
-- actor: an administrator's grant of credits (`admin grant-credits`) is the
-- system's doing, about the user whose ledger it changed. That user reads it
-- as they read their own records (`activity::VISIBLE`), one page of them
-- read in order from this index (`activity::Source::Subject`).
ALTER TABLE activity ADD COLUMN subject_user_id TEXT;
CREATE INDEX activity_by_subject ON activity (subject_user_id, id) WHERE subject_user_id IS NOT NULL;
