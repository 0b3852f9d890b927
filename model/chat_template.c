/* placeholder */ typedef int dp_placeholder_t;
