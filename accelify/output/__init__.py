"""What the command line prints: unified diffs (``diff``), JSON and GitHub reports
(``report``) and the table of finding codes (``findings``)."""
