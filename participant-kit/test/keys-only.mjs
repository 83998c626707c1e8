// The example participant without the barrier: only what a team writes by hand (the
// Idempotency-Key's first answer kept; a compensation of a call never seen answered 200 and
// nothing remembered of it). The contract kit names what it breaks; the bench times it beside
// the kit on the same PostgreSQL.
//   node test/keys-only.mjs <port> <postgres url>
import http from "node:http";
import pg from "pg";

const [port, url] = process.argv.slice(2);
const pool = new pg.Pool({ connectionString: url, max: 4 });
await pool.query("CREATE TABLE IF NOT EXISTS charges (key text PRIMARY KEY, amount integer)");
const answers = new Map();

async function charge(args) {
  const key = `charge-${args.order}-${Math.random().toString(16).slice(2, 10)}`;
  await pool.query("INSERT INTO charges (key, amount) VALUES ($1, $2)", [key, Number(args.amount)]);
  return { status: 200, body: { charge: key, amount: args.amount } };
}

async function refund(charged) {
  if (charged === undefined) return { status: 200, body: { compensated: false } };
  await pool.query("DELETE FROM charges WHERE key = $1", [charged.body.charge]);
  return { status: 200, body: { refunded: charged.body.charge } };
}

http
  .createServer(async (request, response) => {
    const chunks = [];
    for await (const chunk of request) chunks.push(chunk);
    const key = request.headers["idempotency-key"] ?? "";
    if (!answers.has(key)) {
      const args = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
      const forwardKey = request.headers["undolog-forward-key"];
      answers.set(key, forwardKey === undefined ? await charge(args) : await refund(answers.get(forwardKey)));
    }
    const answer = answers.get(key);
    response.writeHead(answer.status, { "Content-Type": "application/json" }).end(JSON.stringify(answer.body));
  })
  .listen(Number(port), "127.0.0.1", () => console.log(`listening on ${port}`));
