-- A page of `GET /reviews?reviewer_id=…` or `?calibration_id=…` across the
-- caller's projects is one walk per project (`pagination::merge_walks`).
-- Read from (reviewer_id, id) or (calibration_id, id), the walk for a
-- project where the reviewer or the calibration has no review read every
-- entry of theirs elsewhere to find none: a caller in 20 projects asking
-- for a reviewer with 10,000 reviews in one of them read ~190,000. With the
-- project in the key, each walk reads only its project's entries, in id
-- order from the cursor on, and stops at the page's size. What else reads
-- these indexes (a reviewer's statistics, a calibration's labels and
-- progress) reads by their first column alone, as before.
DROP INDEX reviews_by_reviewer;
CREATE INDEX reviews_by_reviewer ON reviews (reviewer_id, project_id, id);
DROP INDEX reviews_by_calibration;
CREATE INDEX reviews_by_calibration ON reviews (calibration_id, project_id, id) WHERE calibration_id IS NOT NULL;
