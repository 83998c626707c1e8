"""The MCP gateway (`undolog mcp`): undo for any agent that speaks the Model Context Protocol."""
