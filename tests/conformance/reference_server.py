"""The reference upstream: an `MCPServer` with everything the conformance server scenarios call.

`@modelcontextprotocol/conformance` 0.1.16 tests a server by name: tools such as
`test_simple_text` or `test_sampling`, the resources `test://static-text` and
`test://template/{id}/data`, prompts, completion, logging, subscriptions, and (SEP-1699) a tool
that closes its SSE stream so the client must resume with `GET` + `Last-Event-ID`. This module
serves that surface, written from the scenario descriptions, so the suite can run against it
directly and through Interlock; one tool more, `reference_calls`, tells how often each tool ran
(Interlock's tests check that nothing ran twice).

    python -m tests.conformance.reference_server --port 8001     # Streamable HTTP at /mcp
    python -m tests.conformance.reference_server --stdio         # over stdio

Over HTTP it keeps every stream in an event store (`MemoryEventStore`) and asks clients to come
back after `retry_interval` ms, so streams are resumable. The SDK only sends priming events (and
lets a tool close its stream) when the request's `MCP-Protocol-Version` header is 2025-11-25 or
later; the suite's raw SSE requests send `2025-03-26` on sessions negotiated at 2025-11-25, so a
small ASGI layer (`SessionVersions`) reads the version from the session instead of the header.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
from collections import Counter
from typing import Any

import mcp_types as t
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage

from tests.conformance.event_store import MemoryEventStore
from tests.conformance.session_versions import SessionVersions

__all__ = ["RETRY_INTERVAL_MS", "build_reference_server", "http_app"]

RETRY_INTERVAL_MS = 500
PNG = (  # a 1x1 pixel
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"
    "AAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}
_TITLED = ("First", "Second", "Third")


def _text(value: str) -> t.TextContent:
    return t.TextContent(type="text", text=value)


def _png() -> t.ImageContent:
    return t.ImageContent(type="image", data=PNG, mime_type="image/png")


def _embedded(uri: str, text: str, mime_type: str = "text/plain") -> t.EmbeddedResource:
    contents = t.TextResourceContents(uri=uri, mime_type=mime_type, text=text)
    return t.EmbeddedResource(type="resource", resource=contents)


async def _elicit(ctx: Context, message: str, schema: dict[str, Any]) -> str:
    answer = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    return f"action={answer.action}, content={json.dumps(answer.content or {})}"


def _choices(word: str) -> list[dict[str, str]]:
    titled = enumerate(_TITLED, 1)
    return [{"const": f"value{i}", "title": f"{title} {word}"} for i, title in titled]


def _add_tools(server: MCPServer, calls: Counter[str]) -> None:
    @server.tool(description="Tests simple text content response")
    def test_simple_text() -> str:
        calls["test_simple_text"] += 1
        return "This is a simple text response for testing."

    @server.tool(description="Tests image content response")
    def test_image_content() -> t.CallToolResult:
        return t.CallToolResult(content=[_png()])

    @server.tool(description="Tests audio content response")
    def test_audio_content() -> t.CallToolResult:
        return t.CallToolResult(
            content=[t.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]
        )

    @server.tool(description="Tests embedded resource content response")
    def test_embedded_resource() -> t.CallToolResult:
        resource = _embedded("test://embedded-resource", "This is an embedded resource content.")
        return t.CallToolResult(content=[resource])

    @server.tool(description="Tests response with multiple content types (text, image, resource)")
    def test_multiple_content_types() -> t.CallToolResult:
        data = json.dumps({"test": "data", "value": 123})
        resource = _embedded("test://mixed-content-resource", data, "application/json")
        return t.CallToolResult(content=[_text("Multiple content types test:"), _png(), resource])

    @server.tool(description="Tests tool that emits log messages during execution")
    async def test_tool_with_logging(ctx: Context) -> str:
        steps = ("Tool execution started", "Tool processing data", "Tool execution completed")
        for number, step in enumerate(steps):
            if number:
                await asyncio.sleep(0.05)
            await ctx.session.send_log_message("info", step, related_request_id=ctx.request_id)
        return "Tool with logging executed successfully"

    @server.tool(description="Tests tool that reports progress notifications")
    async def test_tool_with_progress(ctx: Context) -> str:
        calls["test_tool_with_progress"] += 1
        for number, progress in enumerate((0, 50, 100)):
            if number:
                await asyncio.sleep(0.05)
            await ctx.report_progress(progress, 100, f"Completed step {progress} of 100")
        return "Progress test completed"

    @server.tool(description="Tests error response handling")
    def test_error_handling() -> str:
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool(
        description="Tests SSE stream disconnection and client reconnection (SEP-1699): the "
        "server closes the stream and the client resumes it with Last-Event-ID"
    )
    async def test_reconnection(ctx: Context) -> str:
        calls["test_reconnection"] += 1
        await ctx.close_sse_stream()
        await asyncio.sleep(0.1)
        return (
            "Reconnection test completed successfully. If you received this, the client "
            "properly reconnected after stream closure."
        )

    @server.tool(description="Tests server-initiated sampling (LLM completion request)")
    async def test_sampling(prompt: str, ctx: Context) -> str:
        message = t.SamplingMessage(role="user", content=_text(prompt))
        answer = await ctx.session.create_message(
            messages=[message], max_tokens=100, related_request_id=ctx.request_id
        )
        return f"LLM response: {getattr(answer.content, 'text', answer.content)}"

    @server.tool(description="Tests server-initiated elicitation (user input request)")
    async def test_elicitation(message: str, ctx: Context) -> str:
        schema = {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        }
        return "User response: " + await _elicit(ctx, message, schema)

    @server.tool(description="Tests elicitation with default values per SEP-1034")
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        options = ["active", "inactive", "pending"]
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": options,
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verified", "default": True},
            },
            "required": [],
        }
        message = "Please review and update the form fields with defaults"
        return "Elicitation completed: " + await _elicit(ctx, message, schema)

    @server.tool(description="Tests elicitation with enum schema improvements per SEP-1330")
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        options = ["option1", "option2", "option3"]
        schema = {
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "enum": options},
                "titledSingle": {"type": "string", "oneOf": _choices("Option")},
                "legacyEnum": {
                    "type": "string",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {"type": "string", "enum": options},
                },
                "titledMulti": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {"anyOf": _choices("Choice")},
                },
            },
            "required": [],
        }
        message = "Please select options from the enum fields"
        return "Elicitation completed: " + await _elicit(ctx, message, schema)

    @server.tool(description="Tool with JSON Schema 2020-12 features")
    def json_schema_2020_12_tool(
        name: str | None = None, address: dict[str, Any] | None = None
    ) -> str:
        return f"JSON Schema 2020-12 tool called with: {json.dumps([name, address])}"

    @server.tool(
        description="How often each tool of this server process ran (for Interlock's tests)",
        annotations=t.ToolAnnotations(read_only_hint=True),
    )
    def reference_calls() -> dict[str, int]:
        return dict(calls)

    # The scenario reads the input schema verbatim: publish the 2020-12 schema as written,
    # not the one the SDK derives from the signature.
    tool = server._tool_manager.get_tool("json_schema_2020_12_tool")
    assert tool is not None
    tool.parameters = SCHEMA_2020_12


def _add_resources(server: MCPServer) -> None:
    @server.resource(
        "test://static-text",
        name="static-text",
        description="A static text resource for testing",
        mime_type="text/plain",
    )
    def static_text() -> str:
        return "This is the content of the static text resource."

    @server.resource(
        "test://static-binary",
        name="static-binary",
        description="A static binary resource (image) for testing",
        mime_type="image/png",
    )
    def static_binary() -> bytes:
        return base64.b64decode(PNG)

    @server.resource(
        "test://template/{id}/data",
        name="template",
        description="A resource template with parameter substitution",
        mime_type="application/json",
    )
    def template(id: str) -> str:
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.resource(
        "test://watched-resource",
        name="watched-resource",
        description="A resource clients may subscribe to",
        mime_type="text/plain",
    )
    def watched() -> str:
        return "Watched resource content"


def _add_prompts(server: MCPServer) -> None:
    @server.prompt(description="A simple prompt without arguments")
    def test_simple_prompt() -> str:
        return "This is a simple prompt for testing."

    @server.prompt(description="A prompt with required arguments")
    def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
        return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"

    @server.prompt(description="A prompt that includes an embedded resource")
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        resource = _embedded(resourceUri, "Embedded resource content for testing.")
        return [UserMessage(resource), UserMessage("Please process the embedded resource above.")]

    @server.prompt(description="A prompt that includes image content")
    def test_prompt_with_image() -> list[UserMessage]:
        return [UserMessage(_png()), UserMessage("Please analyze the image above.")]

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> t.Completion:
        return t.Completion(values=[], total=0, has_more=False)


def _add_session_methods(server: MCPServer) -> None:
    """logging/setLevel and resource subscriptions (MCPServer has no decorator for them)."""
    subscribed: set[str] = set()
    lowlevel = server._lowlevel_server

    async def set_level(ctx: Any, params: t.SetLevelRequestParams) -> t.EmptyResult:
        return t.EmptyResult()

    async def subscribe(ctx: Any, params: t.SubscribeRequestParams) -> t.EmptyResult:
        subscribed.add(str(params.uri))
        return t.EmptyResult()

    async def unsubscribe(ctx: Any, params: t.UnsubscribeRequestParams) -> t.EmptyResult:
        subscribed.discard(str(params.uri))
        return t.EmptyResult()

    lowlevel.add_request_handler("logging/setLevel", t.SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", t.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", t.UnsubscribeRequestParams, unsubscribe)


def build_reference_server() -> MCPServer:
    """The reference upstream (a new instance: state is per server)."""
    server = MCPServer("interlock-conformance-reference", version="1.0.0", log_level="WARNING")
    _add_tools(server, Counter())
    _add_resources(server)
    _add_prompts(server)
    _add_session_methods(server)
    return server


def http_app(server: MCPServer) -> Any:
    """The Streamable HTTP app at `/mcp`, resumable (event store + retry interval)."""
    app = server.streamable_http_app(
        event_store=MemoryEventStore(), retry_interval=RETRY_INTERVAL_MS, host="127.0.0.1"
    )
    return SessionVersions(app)


def _serve_http(sock: socket.socket) -> None:
    import uvicorn

    config = uvicorn.Config(
        http_app(build_reference_server()),
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


def main() -> None:
    parser = argparse.ArgumentParser(description="Interlock's conformance reference upstream")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="serve Streamable HTTP on 127.0.0.1:PORT/mcp")
    where.add_argument("--fd", type=int, help="serve Streamable HTTP on this listening socket")
    where.add_argument("--stdio", action="store_true", help="serve over stdin/stdout")
    args = parser.parse_args()
    if args.stdio:
        build_reference_server().run("stdio")
        return
    if args.fd is not None:
        sock = socket.socket(fileno=args.fd)
    else:
        sock = socket.create_server(("127.0.0.1", args.port))
    _serve_http(sock)


if __name__ == "__main__":
    main()
