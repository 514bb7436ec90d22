-- A page of a user's ledger of one kind (`GET /transactions?kind=…`), or
-- about one batch run (`?batch_run_id=…`), in the ledger's order (`seq`),
-- read from its cursor on and stopped at its size, as the unfiltered page
-- is from `transactions_by_user`, instead of a walk of every entry of the
-- user's to find the few that pass.
CREATE INDEX transactions_by_kind ON transactions (user_id, kind, seq);
CREATE INDEX transactions_by_batch_run ON transactions (user_id, batch_run_id, seq) WHERE batch_run_id IS NOT NULL;
-- The ledger is listed in `seq` order now, and one entry is found by its id
-- (the UNIQUE index on `id`): (user_id, id) serves no read, only costs
-- every reservation, refund and grant a write.
DROP INDEX transactions_by_user_id;
