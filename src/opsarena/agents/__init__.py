"""Agents: the competitors (scripted builders, external commands, LLMs, people)."""

from opsarena.agents.base import Agent, AgentContext, AgentOutcome

__all__ = ["Agent", "AgentContext", "AgentOutcome"]
