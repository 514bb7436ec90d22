-- What a start prices a run from, beside the document it is also in: a
-- test's iterations and pass threshold, a scenario's longest call. A start
-- refused for credits needs nothing else of its tests, and read every
-- test's document (its evaluators, up to about a megabyte each; a thousand
-- tests in a batch) and every scenario's (its steps) only to learn them, in
-- the one writer every write waits for, for a start that is free to repeat.
-- Columns added at the end of a row lie after its document: a test's are
-- read through the pages of its document, copied, not decoded, rather than
-- kept in an index every create of a test would write (a tenth more bytes
-- written a create, measured). A scenario's, created far less often, come
-- with a covering index.
ALTER TABLE tests ADD COLUMN iterations INTEGER;
ALTER TABLE tests ADD COLUMN pass_threshold REAL;
UPDATE tests SET iterations = json_extract(document, '$.iterations'),
                 pass_threshold = json_extract(document, '$.pass_threshold');
ALTER TABLE scenarios ADD COLUMN max_duration_s INTEGER;
UPDATE scenarios SET max_duration_s = json_extract(document, '$.max_duration_s');
CREATE INDEX scenarios_priced ON scenarios (id, max_duration_s, default_persona_id);
