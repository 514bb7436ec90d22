-- The project's owner pays for its batch runs (DESIGN §3), whoever starts
-- them: the payer is fixed when the credits are reserved, and the unused
-- part goes back to the same user. Batch runs before this migration were
-- paid by whoever started them.
ALTER TABLE batch_runs ADD COLUMN payer_id TEXT REFERENCES users (id);
UPDATE batch_runs SET payer_id = user_id;
