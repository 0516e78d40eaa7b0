"""The names the tools app gives what it runs, for apps that read them without loading
its models (scenarios_admin's approval rules)."""

# An uploaded skill's tool name: this prefix and the skill's name.
SKILL_TOOL_PREFIX = "skill:"
