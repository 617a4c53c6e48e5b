"""The MV's own state: its tables and app transactions, the progress table and recovery,
runtime controls, the no_shuffle run layout and reset."""
