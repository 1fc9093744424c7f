"""The ground layer: configuration and helpers that every role uses; imports no role."""
