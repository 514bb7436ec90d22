-- An integration's phone numbers each keep the row they were registered
-- with: `seq` never changes and is never reused (AUTOINCREMENT), and a
-- PATCH of the list updates the numbers it keeps in place instead of
-- writing the list anew. `GET /integrations/{id}/phone-numbers` pages by
-- it, newest first, so a page starts where the last one ended whatever
-- changed in between (the position it paged by was renumbered by every
-- PATCH). `position` stays the order the client gave, in which the
-- integration shows them; it is no longer unique while a PATCH moves
-- numbers. The numbers already there are taken as registered together,
-- and so are listed in their order.
CREATE TABLE integration_phone_numbers_new (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    integration_id TEXT NOT NULL REFERENCES integrations (id) ON DELETE CASCADE,
    position       INTEGER NOT NULL,
    number         TEXT NOT NULL,
    label          TEXT NOT NULL,
    direction      TEXT NOT NULL,
    UNIQUE (integration_id, number)
);
INSERT INTO integration_phone_numbers_new (integration_id, position, number, label, direction)
    SELECT integration_id, position, number, label, direction FROM integration_phone_numbers
    ORDER BY integration_id, position DESC;
DROP TABLE integration_phone_numbers;
ALTER TABLE integration_phone_numbers_new RENAME TO integration_phone_numbers;
CREATE INDEX integration_phone_numbers_in_order ON integration_phone_numbers (integration_id, position);
CREATE INDEX integration_phone_numbers_newest_first ON integration_phone_numbers (integration_id, seq);
