// An example participant written with the kit, on Node's own http: charges in PostgreSQL,
// refunded by the forward call's first answer.
//   node example/example.mjs <port> <postgres url> [<signing secret>]
import http from "node:http";
import pg from "pg";
import { Barrier, createTables, handler } from "../dist/index.js";

const [port, url, secret = process.env.UNDOLOG_SIGNING_SECRET] = process.argv.slice(2);
const pool = new pg.Pool({ connectionString: url, max: 4 });
await createTables(pool);
await pool.query("CREATE TABLE IF NOT EXISTS charges (key text PRIMARY KEY, amount integer)");
const barrier = new Barrier(pool, secret ? [secret] : []);

const charge = handler(barrier, {
  forward: async (args, client) => {
    const key = `charge-${args.order}-${Math.random().toString(16).slice(2, 10)}`;
    await client.query("INSERT INTO charges (key, amount) VALUES ($1, $2)", [key, Number(args.amount)]);
    // args.seconds: the tests' stand-in for an outside call (a payment API) awaited in the transaction.
    if (args.seconds > 0) await new Promise((resolve) => setTimeout(resolve, args.seconds * 1000));
    return { status: 200, body: { charge: key, amount: args.amount } };
  },
});
const refund = handler(barrier, {
  compensation: async (args, client, charged) => {
    await client.query("DELETE FROM charges WHERE key = $1", [charged.body?.charge]);
    return { status: 200, body: { refunded: charged.body?.charge ?? null } };
  },
});

http
  .createServer((request, response) => {
    if (request.method === "POST" && request.url === "/charge") return charge(request, response);
    if (request.method === "POST" && request.url === "/refund") return refund(request, response);
    response.writeHead(404).end();
  })
  .listen(Number(port), "127.0.0.1", () => console.log(`listening on ${port}`));
