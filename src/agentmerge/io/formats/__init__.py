"""Every input format read as one tensor surface (``checkpoint.Readable``); ``open.open_weights``
opens any weights folder with the reader its layout calls for.
"""
