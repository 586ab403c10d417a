"""What the user asks for: the YAML / Python merge config (``schema``), mergekit configs in and out
(``mergekit``, ``mergekit_export``), safe YAML and name checks (``userinput``), size limits (``limits``).
"""
