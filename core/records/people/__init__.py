"""People and what they may do: users, passwords, roles, password and OpenID Connect sign-in. The ground floor of
the records: every subject asks it who may act."""
