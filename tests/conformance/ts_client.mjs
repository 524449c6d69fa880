// The TypeScript SDK's MCP client (the version pinned in package-lock.json) against one URL:
// list the tools, call three of them, print what it got as JSON on stdout.
//   node ts_client.mjs http://127.0.0.1:8787/mcp/ref
// Run from the folder where install.sh installed the packages (so the SDK resolves).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[2]);
const client = new Client({ name: "interlock-ts-matrix", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(url));
const tools = await client.listTools();
const text = await client.callTool({ name: "test_simple_text" });
const mixed = await client.callTool({ name: "test_multiple_content_types", arguments: {} });
const failing = await client.callTool({ name: "test_error_handling", arguments: {} });
await client.close();
process.stdout.write(JSON.stringify({ tools: tools.tools, text, mixed, failing }));
