// An MCP agent with no UndoLog code: the official TypeScript SDK's client, talking to the
// UndoLog gateway as to any MCP server. Prints one JSON line per tool call it made.
//   node agent.mjs <gateway url> fail-third | rewind
// With UNDOLOG_AGENT_TOKEN set, every request bears it (Authorization: Bearer).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, scenario] = process.argv.slice(2);
const token = process.env.UNDOLOG_AGENT_TOKEN;
const requestInit = token ? { headers: { Authorization: `Bearer ${token}` } } : undefined;
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit });
const client = new Client({ name: "ts-agent", version: "1.0.0" });
await client.connect(transport);

async function call(name, args = {}) {
  const result = await client.callTool({ name, arguments: args });
  const text = result.content.filter((c) => c.type === "text").map((c) => c.text).join(" ");
  console.log(JSON.stringify({ name, isError: Boolean(result.isError), text, meta: result._meta ?? {} }));
  return result;
}

const tools = (await client.listTools()).tools.map((t) => t.name);
console.log(JSON.stringify({ tools }));
if (scenario === "fail-third") {
  await call("create_issue", { title: "first" });
  await call("create_issue", { title: "second" });
  const third = await call("create_issue", { title: "third", fail: true });
  if (third.isError) await call("undolog_abort", { reason: "create_issue failed: " + third.content[0].text });
} else if (scenario === "rewind") {
  const first = await call("create_issue", { title: "keep" });
  await call("create_issue", { title: "drop one" });
  await call("create_issue", { title: "drop two" });
  await call("undolog_rewind", { to_step: first._meta["io.undolog/step"], reason: "wrong issues filed" });
  await call("create_issue", { title: "after the rewind" });
  await call("undolog_status");
  await call("undolog_commit");
} else {
  throw new Error(`no scenario ${scenario}`);
}
await transport.terminateSession();
await client.close();
