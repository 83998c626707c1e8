// UndoLog's participant kit for Node: the barrier that keeps every rule of the wire protocol in
// the participant's own PostgreSQL transaction, with its effect (the same tables and semantics
// as the Python kit, undolog.participant; docs/participants.md):
// - a forward call's Idempotency-Key seen before: its first answer, nothing applied twice;
// - a compensation of a forward key never seen: 2xx, nothing to undo, and the key recorded so
//   that the forward call arriving after it (the late forward) is refused 410, never applied;
// - with the Webhook's signing secrets: a call not signed as the operator signs it, 401;
// - an Undolog-Fence lower than the highest seen for its Undolog-Shard: 409.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Pool, PoolClient } from "pg";
import { Webhook } from "standardwebhooks";

export const LATE_FORWARD_STATUS = 410;

export interface Answer {
  status: number;
  body: unknown;
}

/** An operator's call as received: headers (any case) and the raw body. */
export interface Call {
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

export type Forward = (args: any, client: PoolClient) => Promise<Answer>;
export type Compensation = (args: any, client: PoolClient, forwardAnswer: Answer) => Promise<Answer>;

export const TABLES = [
  "CREATE TABLE IF NOT EXISTS undolog_barrier (key text PRIMARY KEY, kind text NOT NULL, forward_key text, status integer, body text)",
  "CREATE TABLE IF NOT EXISTS undolog_fences (shard text PRIMARY KEY, fence bigint NOT NULL)",
];

export async function createTables(pool: Pool): Promise<void> {
  for (const statement of TABLES) await pool.query(statement);
}

function header(call: Call, name: string): string | undefined {
  for (const [key, value] of Object.entries(call.headers)) {
    if (key.toLowerCase() === name) return Array.isArray(value) ? value[0] : value;
  }
  return undefined;
}

type Seen = { kind: string; answer: Answer | null } | null;

async function claim(client: PoolClient, key: string, kind: string, forwardKey: string | null): Promise<Seen> {
  const inserted = await client.query(
    "INSERT INTO undolog_barrier (key, kind, forward_key) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING",
    [key, kind, forwardKey],
  );
  if (inserted.rowCount === 1) return null;
  const found = await client.query("SELECT kind, status, body FROM undolog_barrier WHERE key = $1", [key]);
  const row = found.rows[0];
  return { kind: row.kind, answer: row.status === null ? null : { status: row.status, body: JSON.parse(row.body) } };
}

async function answered(client: PoolClient, key: string, answer: Answer): Promise<void> {
  await client.query("UPDATE undolog_barrier SET status = $1, body = $2 WHERE key = $3", [
    answer.status,
    JSON.stringify(answer.body ?? null),
    key,
  ]);
}

export class Barrier {
  private readonly verifiers: Webhook[];

  constructor(private readonly pool: Pool, signingSecrets: string[] = []) {
    this.verifiers = signingSecrets.map((secret) => new Webhook(secret));
  }

  private refused(call: Call): Answer | null {
    if (this.verifiers.length === 0) return null;
    const headers: Record<string, string> = {};
    for (const [key, value] of Object.entries(call.headers)) if (typeof value === "string") headers[key] = value;
    for (const verifier of this.verifiers) {
      try {
        verifier.verify(call.body, headers);
        return null;
      } catch {
        continue;
      }
    }
    return { status: 401, body: { error: "the call is not signed as the operator signs it" } };
  }

  private async stale(client: PoolClient, call: Call): Promise<Answer | null> {
    const fence = header(call, "undolog-fence");
    const shard = header(call, "undolog-shard") ?? "0/1";
    if (fence === undefined || !/^\d+$/.test(fence)) return null;
    const result = await client.query(
      "INSERT INTO undolog_fences (shard, fence) VALUES ($1, $2) ON CONFLICT (shard) " +
        "DO UPDATE SET fence = GREATEST(undolog_fences.fence, EXCLUDED.fence) RETURNING fence",
      [shard, fence],
    );
    const highest = BigInt(result.rows[0].fence);
    return highest > BigInt(fence) ? { status: 409, body: { error: `stale fence ${fence}: shard ${shard} has seen ${highest}` } } : null;
  }

  /** Run `work` in one transaction: committed with its answer, rolled back on any error. */
  private async transaction(work: (client: PoolClient) => Promise<Answer>): Promise<Answer> {
    const client = await this.pool.connect();
    try {
      await client.query("BEGIN");
      const answer = await work(client);
      await client.query("COMMIT");
      return answer;
    } catch (error) {
      await client.query("ROLLBACK");
      throw error;
    } finally {
      client.release();
    }
  }

  /** The forward call, once, in one transaction with its effect. */
  async forward(call: Call, apply: Forward): Promise<Answer> {
    const key = header(call, "idempotency-key");
    if (key === undefined) return { status: 400, body: { error: "no Idempotency-Key" } };
    return this.transaction(async (client) => {
      const refused = this.refused(call) ?? (await this.stale(client, call));
      if (refused) return refused;
      const seen = await claim(client, key, "forward", null);
      if (seen !== null) {
        if (seen.kind === "compensated") {
          return { status: LATE_FORWARD_STATUS, body: { error: "compensated before it arrived: not applied", key } };
        }
        return seen.answer ?? { status: 409, body: { error: "the same call is being applied" } };
      }
      const answer = await apply(JSON.parse(call.body || "null"), client);
      await answered(client, key, answer);
      return answer;
    });
  }

  /** The compensation, once; a forward call never seen is marked so it is never applied. */
  async compensate(call: Call, undo: Compensation): Promise<Answer> {
    const key = header(call, "idempotency-key");
    const forwardKey = header(call, "undolog-forward-key");
    if (key === undefined || forwardKey === undefined) {
      return { status: 400, body: { error: "no Idempotency-Key or Undolog-Forward-Key" } };
    }
    return this.transaction(async (client) => {
      const refused = this.refused(call) ?? (await this.stale(client, call));
      if (refused) return refused;
      const seen = await claim(client, key, "compensation", forwardKey);
      if (seen !== null) return seen.answer ?? { status: 409, body: { error: "the same compensation is being applied" } };
      const applied = await claim(client, forwardKey, "compensated", null);
      const answer =
        applied === null || applied.kind === "compensated"
          ? { status: 200, body: { compensated: false, why: "the forward call was never applied" } }
          : await undo(JSON.parse(call.body || "null"), client, applied.answer ?? { status: 200, body: null });
      await answered(client, key, answer);
      return answer;
    });
  }
}

async function readBody(request: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

function send(response: ServerResponse, answer: Answer): void {
  const payload = JSON.stringify(answer.body ?? null);
  response.writeHead(answer.status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(payload) });
  response.end(payload);
}

/**
 * A handler for Node's http and express (`(req, res)`): with express, mount it before any body
 * parser (it reads the raw body, which the signature covers). With fastify, parse JSON bodies as
 * strings and call the barrier from the route: `barrier.forward(request, apply)` (a fastify
 * request has the `headers` and `body` a Call needs).
 */
export function handler(
  barrier: Barrier,
  route: { forward: Forward } | { compensation: Compensation },
): (request: IncomingMessage, response: ServerResponse) => Promise<void> {
  return async (request, response) => {
    try {
      const call = { headers: request.headers, body: await readBody(request) };
      const answer = "forward" in route ? await barrier.forward(call, route.forward) : await barrier.compensate(call, route.compensation);
      send(response, answer);
    } catch (error) {
      send(response, { status: 500, body: { error: String(error) } });
    }
  };
}
