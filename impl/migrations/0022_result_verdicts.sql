-- Each test result's automated verdicts beside its document: its overall
-- verdict (`status` is `passed`) and each evaluation's name and `passed`,
-- in the result's order. Reviewer statistics compare every label of every
-- review with these; read out of the document, each comparison read the
-- whole conversation (up to a call's record) for a boolean and a few
-- names. Written with the result, in its transaction (`engine::queue::
-- finish`); a result's go with it. Results stored before this migration
-- get theirs from their documents (one that is not JSON, which nothing
-- writes, gets none: its automated verdicts are unknown).
CREATE TABLE result_verdicts (
    test_result_id TEXT PRIMARY KEY REFERENCES test_results (id) ON DELETE CASCADE,
    passed         INTEGER NOT NULL,
    -- [{"name": ..., "passed": ...}]
    evaluations    TEXT NOT NULL
) WITHOUT ROWID;

INSERT INTO result_verdicts (test_result_id, passed, evaluations)
SELECT t.id, t.status = 'passed',
       (SELECT json_group_array(json_object('name', json_extract(e.value, '$.name'),
                                            'passed', json(CASE WHEN json_extract(e.value, '$.passed')
                                                                THEN 'true' ELSE 'false' END)))
        FROM json_each(t.document, '$.evaluations') e)
FROM test_results t WHERE json_valid(t.document);
