"""The node's TPM: TCTI choice (tcti), one ESAPI conversation (session: EK, AK, activation, quotes,
PCRs), and the minion_id (identity). tpm2-pytss is imported lazily inside session methods."""
