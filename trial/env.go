package trial

// NoProxy is what a Trial's processes get as NO_PROXY and no_proxy: the
// Trial's own loopback, which is never worth a trip through the proxy.
const NoProxy = "127.0.0.1,localhost,::1"

// ProxyEnv is the environment that points a Trial's clients at the proxy
// at proxyURL without any configuration of theirs: both cases of
// HTTPS_PROXY and HTTP_PROXY (curl reads only http_proxy in lower case,
// Go reads upper case first), NO_PROXY and no_proxy for loopback, and
// NODE_USE_ENV_PROXY=1, which makes Node's fetch and https (22.21+, 24.5+)
// read them too. trialnet's launcher gives it to every command it
// starts, and the NRI plugin to every container it places in a Trial.
func ProxyEnv(proxyURL string) []string {
	return []string{
		"HTTPS_PROXY=" + proxyURL, "HTTP_PROXY=" + proxyURL, "https_proxy=" + proxyURL, "http_proxy=" + proxyURL,
		"NO_PROXY=" + NoProxy, "no_proxy=" + NoProxy, "NODE_USE_ENV_PROXY=1",
	}
}

// ResolvConf is a transparent Trial's /etc/resolv.conf, naming its DNS
// stub on the Trial's own loopback. No search domains (a short name is
// not sent out with the host's appended), no EDNS (the stub's answers
// are one record), and a short wait: the stub answers at once or not at
// all.
const ResolvConf = `# trialnet: this Trial's own DNS stub (transparent mode), in this
# Trial's view only. It answers the names the Trial's allowlist admits
# with addresses its connections are checked at, and forwards nothing.
nameserver 127.0.0.53
options timeout:2 attempts:2
`
