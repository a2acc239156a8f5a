"""Unit tests of the control socket, prestop and the dying gasp (launcher.control)."""
