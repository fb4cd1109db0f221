"""What the pages share: the page skeleton and sidebar context (common), safe display of text and tables
(display), the guarded Promote dialog (promote). A face like pages/: display and input only, every change
goes through `core`. Kept out of pages/, whose every file Streamlit would list as a page on the first run
after a start (tests/test_cold_sidebar.py).
"""
