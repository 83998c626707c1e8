// An MCP server (the official SDK 1.x, over stdio) whose tools advertise their own undo in their
// annotations: SEP-3172's `recovery` (reserve -> release, its parameter a runtime expression over
// the result) and fastmcp's `x-compensation-pair` (tag -> untag; charge -> refund, whose
// chargeId the gateway cannot find, so charge stays unmapped). `stock` reads what is held;
// `open_aisle` adds a tool (`aisle_<n>`) and says the list changed.
//   node annotated_server.mjs
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const object = (properties, required = Object.keys(properties)) => ({ type: "object", properties, required });
const text = { type: "string" };
const reservations = new Map();
const tags = new Map();
let next = 1;

const tools = [
  {
    name: "reserve",
    inputSchema: object({ sku: text }),
    outputSchema: object({ reservation: object({ id: text }) }),
    annotations: {
      readOnlyHint: false,
      recovery: {
        strategy: "compensation",
        compensatingOperation: { operationId: "release", parameters: { reservationId: "$response.body#/reservation/id" } },
      },
    },
  },
  { name: "release", inputSchema: object({ reservationId: text }), annotations: { destructiveHint: true } },
  {
    name: "tag",
    inputSchema: object({ item: text, tag: text }),
    outputSchema: object({ tagId: text }),
    annotations: { "x-compensation-pair": "untag" },
  },
  { name: "untag", inputSchema: object({ tagId: text }) },
  { name: "charge", inputSchema: object({ amount: { type: "number" } }), annotations: { "x-compensation-pair": "refund" } },
  { name: "refund", inputSchema: object({ chargeId: text }) },
  { name: "stock", inputSchema: object({}), annotations: { readOnlyHint: true } },
  { name: "open_aisle", inputSchema: object({}), annotations: { readOnlyHint: true } },
];

function answer(value) {
  return { content: [{ type: "text", text: JSON.stringify(value) }], structuredContent: value };
}

const calls = {
  reserve: ({ sku }) => {
    const id = `r-${next++}`;
    reservations.set(id, sku);
    return answer({ reservation: { id } });
  },
  release: ({ reservationId }) => answer({ released: reservations.delete(reservationId) }),
  tag: ({ item, tag }) => {
    const tagId = `t-${next++}`;
    tags.set(tagId, `${item}:${tag}`);
    return answer({ tagId });
  },
  untag: ({ tagId }) => answer({ untagged: tags.delete(tagId) }),
  charge: ({ amount }) => answer({ chargeId: `c-${next++}`, amount }),
  refund: () => answer({ refunded: true }),
  stock: () => answer({ reservations: [...reservations.values()], tags: [...tags.values()] }),
  open_aisle: async () => {
    const name = `aisle_${tools.filter((t) => t.name.startsWith("aisle_")).length + 1}`;
    tools.push({ name, inputSchema: object({}), annotations: { readOnlyHint: true } });
    calls[name] = () => answer({ aisle: name });
    await server.sendToolListChanged();
    return answer({ opened: name });
  },
};

const server = new Server({ name: "annotated", version: "1.0.0" }, { capabilities: { tools: { listChanged: true } } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
server.setRequestHandler(CallToolRequestSchema, async (request) => calls[request.params.name](request.params.arguments ?? {}));
await server.connect(new StdioServerTransport());
