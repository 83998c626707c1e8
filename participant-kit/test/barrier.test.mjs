// The barrier's semantics against a real PostgreSQL (UNDOLOG_TEST_POSTGRES: its URL), with
// Node's test runner: `npm test`. The contract kit (Python's undolog.testing) checks the example
// participant over HTTP besides (tests/cluster/test_participant_kit.py).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import pg from "pg";
import { Barrier, createTables, LATE_FORWARD_STATUS } from "../dist/index.js";

const url = process.env.UNDOLOG_TEST_POSTGRES;
const pool = url ? new pg.Pool({ connectionString: url }) : null;
const skip = url ? false : "UNDOLOG_TEST_POSTGRES is not set";

before(async () => {
  if (!pool) return;
  await createTables(pool);
  await pool.query("CREATE TABLE IF NOT EXISTS effects (key text PRIMARY KEY)");
});
after(async () => pool?.end());

const call = (key, extra = {}) => ({ headers: { "Idempotency-Key": key, ...extra }, body: "{}" });
const apply = async (_, client) => {
  const key = randomUUID();
  await client.query("INSERT INTO effects (key) VALUES ($1)", [key]);
  return { status: 200, body: { effect: key } };
};
const effects = async () => Number((await pool.query("SELECT count(*) FROM effects")).rows[0].count);

test("a repeated forward key is answered as the first, with no second effect", { skip }, async () => {
  const barrier = new Barrier(pool);
  const before = await effects();
  const key = `${randomUUID()}:charge:fwd`;
  const first = await barrier.forward(call(key), apply);
  const again = await barrier.forward(call(key), apply);
  assert.deepEqual(again, first);
  assert.equal(await effects(), before + 1);
});

test("a compensation of a call never seen succeeds, and that call arriving late is refused 410", { skip }, async () => {
  const barrier = new Barrier(pool);
  const before = await effects();
  const key = `${randomUUID()}:charge:fwd`;
  const undone = await barrier.compensate(call(`undo-${randomUUID()}`, { "Undolog-Forward-Key": key }), async () => {
    throw new Error("nothing was applied: never called");
  });
  assert.equal(undone.status, 200);
  const late = await barrier.forward(call(key), apply);
  assert.equal(late.status, LATE_FORWARD_STATUS);
  assert.equal(await effects(), before);
});

test("an older fence of a shard is refused once a newer one was seen", { skip }, async () => {
  const barrier = new Barrier(pool);
  const shard = `0/${randomUUID().slice(0, 4)}`;
  const newer = await barrier.forward(call(`${randomUUID()}:a:fwd`, { "Undolog-Fence": "9", "Undolog-Shard": shard }), apply);
  assert.equal(newer.status, 200);
  const older = await barrier.forward(call(`${randomUUID()}:b:fwd`, { "Undolog-Fence": "8", "Undolog-Shard": shard }), apply);
  assert.equal(older.status, 409);
});

test("an effect that throws leaves neither it nor the key", { skip }, async () => {
  const barrier = new Barrier(pool);
  const key = `${randomUUID()}:charge:fwd`;
  const before = await effects();
  await assert.rejects(
    barrier.forward(call(key), async (args, client) => {
      await apply(args, client);
      throw new Error("the participant failed after its effect");
    }),
  );
  assert.equal(await effects(), before);
  const retried = await barrier.forward(call(key), apply);
  assert.equal(retried.status, 200);
  assert.equal(await effects(), before + 1);
});
