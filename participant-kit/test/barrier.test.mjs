// The barrier's semantics against a real PostgreSQL (UNDOLOG_TEST_POSTGRES: its URL), with
// Node's test runner: `npm test`. The contract kit (Python's undolog.testing) checks the example
// participant over HTTP besides (tests/cluster/test_participant_kit.py).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import pg from "pg";
import http from "node:http";
import { Barrier, createTables, handler, LATE_FORWARD_STATUS } from "../dist/index.js";

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

// One key sent twice to a framework's route, then a compensation and the late forward of
// another key: the same answers as the barrier gives directly, one effect.
async function exercise(base) {
  const post = (path, key, extra = {}) =>
    fetch(`${base}${path}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": key, ...extra },
      body: JSON.stringify({ order: "o-1" }),
    }).then(async (answer) => [answer.status, await answer.json()]);
  const before = await effects();
  const key = `${randomUUID()}:charge:fwd`;
  const first = await post("/charge", key);
  assert.equal(first[0], 200);
  assert.deepEqual(await post("/charge", key), first);
  const never = `${randomUUID()}:charge:fwd`;
  assert.equal((await post("/refund", `undo-${randomUUID()}`, { "Undolog-Forward-Key": never }))[0], 200);
  assert.equal((await post("/charge", never))[0], LATE_FORWARD_STATUS);
  assert.equal(await effects(), before + 1);
}

const refund = async () => ({ status: 200, body: { refunded: true } });

test("the handler serves express and Node's http alike; fastify calls the barrier itself", { skip }, async () => {
  const { default: express } = await import("express");
  const barrier = new Barrier(pool);
  const app = express(); // the kit's handler before any body parser: it reads the raw body, which is signed
  app.post("/charge", handler(barrier, { forward: apply }));
  app.post("/refund", handler(barrier, { compensation: refund }));
  const plain = http.createServer((request, response) =>
    (request.url === "/charge" ? handler(barrier, { forward: apply }) : handler(barrier, { compensation: refund }))(
      request,
      response,
    ),
  );
  const { default: Fastify } = await import("fastify");
  const fastify = Fastify();
  fastify.addContentTypeParser("application/json", { parseAs: "string" }, (_, body, done) => done(null, body));
  const answer = (reply, said) => reply.code(said.status).send(said.body);
  fastify.post("/charge", async (request, reply) => answer(reply, await barrier.forward(request, apply)));
  fastify.post("/refund", async (request, reply) => answer(reply, await barrier.compensate(request, refund)));
  for (const listener of [app, plain]) {
    const server = await new Promise((listening) => {
      const started = listener.listen(0, "127.0.0.1", () => listening(started));
    });
    await exercise(`http://127.0.0.1:${server.address().port}`);
    server.close();
    server.closeAllConnections(); // the client's keep-alive sockets would hold the process open
  }
  await exercise(await fastify.listen({ port: 0, host: "127.0.0.1" }));
  await fastify.close();
});
