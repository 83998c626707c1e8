// An agent on the current major of the official TypeScript SDK (@modelcontextprotocol/client 2.x),
// which speaks the stateless revision (2026-07-28): no session, so it keeps the saga handle the
// first mapped call's result gives and passes it back. No UndoLog code beyond that argument.
// Prints one JSON line per tool call.
//   node agent2026.mjs <gateway url> abort-after-three
// With UNDOLOG_AGENT_TOKEN set, every request bears it (Authorization: Bearer), as an agent's
// token from its authorization server or its pod's ServiceAccount would.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, scenario] = process.argv.slice(2);
const token = process.env.UNDOLOG_AGENT_TOKEN;
const requestInit = token ? { headers: { Authorization: `Bearer ${token}` } } : undefined;
// The SDK's own default is the 2025 handshake; "auto" probes with server/discover and speaks
// 2026-07-28 to a server that does, as the SDK's guide tells agents to.
const client = new Client({ name: "ts-agent-2026", version: "1.0.0" }, { versionNegotiation: { mode: "auto" } });
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit }));

async function call(name, args = {}) {
  const result = await client.callTool({ name, arguments: args });
  const text = result.content.filter((c) => c.type === "text").map((c) => c.text).join(" ");
  console.log(JSON.stringify({ name, isError: Boolean(result.isError), text, meta: result._meta ?? {} }));
  return result;
}

console.log(JSON.stringify({ protocol: client.getNegotiatedProtocolVersion?.() ?? null }));
if (scenario === "abort-after-three") {
  const first = await call("create_issue", { title: "first" });
  const undolog_saga = first._meta["io.undolog/saga-handle"];
  await call("create_issue", { title: "second", undolog_saga });
  await call("create_issue", { title: "third", undolog_saga });
  await call("undolog_abort", { undolog_saga, reason: "the agent changed its mind" });
} else {
  throw new Error(`no scenario ${scenario}`);
}
await client.close();
