-- The longest a run's conversation may last, as priced when its credits
-- were reserved: a limit raised while the run waits must not make it cost
-- more than was reserved for it. NULL for runs queued before this
-- migration (they use the limits as they are).
ALTER TABLE runs ADD COLUMN max_duration_s INTEGER;
