"""SysBench (Qin et al., arXiv 2408.10943): data, conversations and history ablations,
the checklist judge, CSR/ISR/SSR metrics, the paper's tables and figures, and the import of
upstream's published workbooks. ``benchmark`` registers it.
"""
