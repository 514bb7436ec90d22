-- A test result is answered as its stored document: the `TestResult` the
-- engine encoded when its run ended. Those stored before `blinded` became
-- one of its fields (with reviews, migration 0004) lack the field, which
-- the spec requires (null: nothing of it is hidden); they say so now, as
-- every result stored since does. (A document that is not JSON, which
-- nothing writes, is left as it is rather than stop every start.)
UPDATE test_results SET document = json_set(document, '$.blinded', NULL)
WHERE json_valid(document) AND json_type(document, '$.blinded') IS NULL;
