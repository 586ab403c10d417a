"""Every input format read as one tensor surface (``checkpoint.Readable``); ``open.open_model`` opens any model
reference with the reader its layout calls for.
"""
