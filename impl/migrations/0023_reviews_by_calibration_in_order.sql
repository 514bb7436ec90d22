-- A calibration's reviews in the order of their ids, for a page of
-- `GET /reviews?calibration_id=…` (up to 500 results × 50 reviewers' reviews)
-- read from its cursor on and stopped at its size, as the other filters
-- of that list are (`reviews_by_reviewer`; a result's few reviews by its
-- key), instead of a walk of every review of the project. The index it
-- replaces found them unordered; what else reads a calibration's reviews
-- (its labels, its progress) finds them in this one the same way.
DROP INDEX reviews_by_calibration;
CREATE INDEX reviews_by_calibration ON reviews (calibration_id, id) WHERE calibration_id IS NOT NULL;
